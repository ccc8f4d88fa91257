#!/bin/bash
#SBATCH -c 16
#SBATCH --mem-per-cpu=4G
make -j16
