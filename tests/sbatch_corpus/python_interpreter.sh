#!/usr/bin/env python3
#SBATCH --gres=gpu:1
#SBATCH -c 6
#SBATCH -J py-job
import torch
print(torch.cuda.device_count())
