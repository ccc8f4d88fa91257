#!/bin/bash
#SBATCH --dependency=afterok:1234:1235
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --job-name=evaluate
python evaluate.py
