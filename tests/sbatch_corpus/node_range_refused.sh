#!/bin/bash
#SBATCH --nodes=2-4
#SBATCH --gpus-per-node=8
srun python elastic.py
