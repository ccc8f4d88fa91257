#!/bin/bash
#SBATCH --time 1-12
#SBATCH --mem 48000
#SBATCH --gpus 2 --cpus-per-gpu 12
python run.py
