#!/bin/bash

# Training job -- keep these lines tidy, they said.
#SBATCH    --gpus=2      # two GPUs
#SBATCH	-c	8
# SBATCH --gpus=8   (a space after '#': only a comment)
##SBATCH --mem=1T   (two '#': only a comment)

#SBATCH --mem 16G  --time  1:30:00   # memory and time
#SBATCH -J "my job"
python train.py
#SBATCH --gpus=5   (after the first command: ignored)
