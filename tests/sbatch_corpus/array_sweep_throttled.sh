#!/bin/bash
#SBATCH --array=0-99%10
#SBATCH --output=sweep_%A_%a.out
#SBATCH --gres=gpu:1
#SBATCH --time=30
python sweep.py --trial "$SLURM_ARRAY_TASK_ID"
