#!/bin/bash
#SBATCH --gpus=4
#SBATCH -t 60
#GPUD --gpus=2 --gpu-type H100-80GB
python train.py
