#!/bin/bash
#SBATCH --job=abbrev
#SBATCH --part=gpu --acco=phys
#SBATCH --nodes=2 --tasks-per-node=4
#SBATCH --gpus-per-n=4
#SBATCH --out=logs/%x-%j.out
#SBATCH --cluster=east
srun python train.py
