#!/bin/bash
#SBATCH --exclusive
#SBATCH --constraint=a100
#SBATCH --gres=gpu:2
python bench.py
