"""``python -m gpuctl``: the same as the ``gpuctl`` console script."""

from gpuctl.fastpath import main

if __name__ == "__main__":
    main()
