#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --array=0-9%2
#SBATCH --output=logs/%x_%A_%3a.out
#SBATCH --error=logs/%x_%J.err
#SBATCH --gpus=1
#SBATCH --mem=0
#SBATCH --tasks-per-node=1
python sweep.py --index "$SLURM_ARRAY_TASK_ID"
