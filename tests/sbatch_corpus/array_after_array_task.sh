#!/bin/bash
#SBATCH --array=1-5%1
#SBATCH --dependency=afterok:77_3
#SBATCH --gpus=h100:1
python step.py
