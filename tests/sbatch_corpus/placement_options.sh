#!/bin/bash
#SBATCH -w gpu[01-02]
#SBATCH --reservation=maint
#SBATCH -x gpu05
#SBATCH --qos=urgent
#SBATCH --gres=gpu:1
python job.py
