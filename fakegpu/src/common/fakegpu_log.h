/* The log of unimplemented functions, shared (as a hidden copy) by every fake library:
 * VRAMSHIM_FAKEGPU_LOG names a file to which each unimplemented function's name is appended,
 * once per process and function (one line, written with one write(2) so that concurrent
 * processes do not interleave). Unset or empty: nothing is written. */
#pragma once

/* Logs NAME unless *logged is already set (then sets it). Safe from any thread. */
__attribute__((visibility("hidden"))) void fg_log_unimplemented(int *logged, const char *name);
