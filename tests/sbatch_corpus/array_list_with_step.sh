#!/bin/bash
#SBATCH -a 1,3,5-9:2
#SBATCH -o seeds-%a.log
python eval.py --seed $SLURM_ARRAY_TASK_ID
