#!/bin/bash
#SBATCH --begin=2027-01-20T08:00
#SBATCH --deadline=2027-01-21
#SBATCH -t 2:00:00
python report.py
