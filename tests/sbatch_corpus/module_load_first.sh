#!/bin/bash
module load cuda/12.2
#SBATCH --gpus=8
#SBATCH -t 10
python job.py
