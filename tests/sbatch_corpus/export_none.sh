#!/bin/bash
#SBATCH --export=NONE
#SBATCH --get-user-env
source /etc/profile
python job.py
