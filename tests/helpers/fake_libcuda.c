/* A stand-in libcuda.so for the --warm CUDA rule: a C++ warm server that has it mapped counts as
   having initialised CUDA. Nothing in it is ever called. */
int ctrun_fake_libcuda_marker(void) { return 0; }
