#!/bin/bash
#SBATCH -J quick -p debug -A proj -q high
#SBATCH -t 15 -c 2 -G 1
#SBATCH -o out.txt -e err.txt -D /scratch/alice
python quick.py
