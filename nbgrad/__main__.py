"""``python -m nbgrad``: the same command line as the ``nbgrad`` console script."""

from .cli import main

if __name__ == "__main__":
    main()
