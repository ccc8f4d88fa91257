#!/bin/bash
#SBATCH --exclusive --hint nomultithread -C "a100|h100" --gpus 2
python job.py
