#!/bin/bash
#SBATCH --exclusive=user
#SBATCH --gpus=1
python job.py
