#!/bin/bash
#SBATCH --gpsu=2
python job.py
