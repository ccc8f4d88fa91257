#!/bin/bash
#SBATCH -J nightly
#SBATCH -d singleton
#SBATCH --begin=now+1hour
./nightly.sh
