#!/bin/bash
#SBATCH -v
#SBATCH --profile=all --acctg-freq=30
#SBATCH --gpus=1
python job.py
