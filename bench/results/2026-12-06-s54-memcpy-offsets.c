#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=atol(argv[1]); int step=atoi(argv[2]);
  char*base=aligned_alloc(4096,4*n+65536);
  char*a=base+8192; memset(a,1,n);
  for(int o=0;o<4096;o+=step){
    char*b=base+8192+n+8192+o; memset(b,2,n);
    long it=(long)(2e8/n)+1; double t0=now();
    for(long k=0;k<it;k++){memcpy(b,a,n);__asm__ volatile(""::"r"(b):"memory");}
    double t=now()-t0; double g=(double)n*it/t/(1<<30);
    if(g<(argc>3?atof(argv[3]):15)) printf("n=%zu off %4d: %.2f GiB/s\n",n,o,g);}
}
