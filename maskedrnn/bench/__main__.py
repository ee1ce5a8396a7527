"""`python -m maskedrnn.bench` (see `--help`)."""

from maskedrnn.bench.cli import main

if __name__ == "__main__":
    main()
