#!/bin/bash
#SBATCH --gres=gpu:2,nvme:1
python job.py
