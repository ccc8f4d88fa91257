#!/bin/bash
#SBATCH --export=ALL,WANDB_MODE=offline
python train.py
