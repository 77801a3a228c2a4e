/* The avx2 build of kernels.c (compiler flags: setup.py). */
#include "kernels.c"
