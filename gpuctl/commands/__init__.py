"""One module per gpuctl verb; each defines ``command`` (a click command).

gpuctl.main imports a verb's module only when that verb runs.
"""
