#!/bin/bash
#SBATCH --gpu=2
python job.py
