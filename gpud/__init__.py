"""gpud: a GPU batch scheduler for bare-metal clusters."""
__version__ = "0.1.0"
