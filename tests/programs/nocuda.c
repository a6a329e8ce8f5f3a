/* nocuda: never touches CUDA (the preload must stay silent and cheap). */
#include <stdio.h>

int main(void)
{
    puts("hello");
    return 0;
}
