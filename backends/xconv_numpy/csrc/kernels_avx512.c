/* The avx512 build of kernels.c (compiler flags: setup.py). */
#include "kernels.c"
