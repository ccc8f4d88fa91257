#!/bin/bash
#SBATCH -J llm-pretrain
#SBATCH -N 4-4 --ntasks=32
#SBATCH --gres=gpu:h100:8
#SBATCH --exclusive
#SBATCH --switches=1@30:00
#SBATCH -x gpu[13-16],gpu20
#SBATCH --constraint="ib&h100"
#SBATCH --time=3-00:00:00
srun --label python pretrain.py
