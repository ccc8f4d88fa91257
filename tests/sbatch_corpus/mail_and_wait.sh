#!/bin/bash
#SBATCH --wait
#SBATCH --mail-type=ALL
python pipeline_step.py
