#!/bin/bash
#SBATCH -d afterany:100?afternotok:101
python cleanup.py
