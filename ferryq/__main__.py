"""``python -m ferryq``: the same program as the ``ferryq`` command."""

from ferryq.cli import main

if __name__ == "__main__":
    main()
