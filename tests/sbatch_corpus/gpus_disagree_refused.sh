#!/bin/bash
#SBATCH -N 2
#SBATCH --gpus=8
#SBATCH --gpus-per-node=8
srun python train.py
