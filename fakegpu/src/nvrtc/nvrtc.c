/* The fake NVRTC (libnvrtc.so.12 and .13): programs that compile, without compiling, into a
 * placeholder image that the fake driver loads as a module like any other (cuModuleLoadData
 * takes any image; its functions launch and do nothing). PyTorch's jiterator (the kernels it
 * compiles at run time, such as the one torch.linalg.det's sign goes through) calls
 * nvrtcVersion, nvrtcCreateProgram, nvrtcCompileProgram, nvrtcGetCUBIN or nvrtcGetPTX (and
 * their sizes) and nvrtcDestroyProgram, then loads the image and launches its kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FG_EXPORT __attribute__((visibility("default")))
typedef int nvrtcResult;
enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
    NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
};

/* The release of the wheels the symbol lists come from: NVRTC 13.5 and 12.9. */
#if FG_SONAME_MAJOR >= 13
#define MAJOR 13
#define MINOR 5
#else
#define MAJOR 12
#define MINOR 9
#endif

struct program {
    int compiled;
    char *image; /* the placeholder PTX / CUBIN, with the program's name */
    size_t image_size;
    char **names; /* name expressions added, lowered to themselves */
    int name_count;
};

FG_EXPORT nvrtcResult nvrtcVersion(int *major, int *minor)
{
    if (!major || !minor)
        return NVRTC_ERROR_INVALID_INPUT;
    *major = MAJOR;
    *minor = MINOR;
    return NVRTC_SUCCESS;
}

/* The architectures offered (compute capability x 10): the cards the fake presets model
 * (7.5 to 9.0) and later ones; not checked against a real NVRTC's list. */
#if MAJOR >= 13
static const int archs[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
#else
static const int archs[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 120, 121};
#endif
#define ARCH_COUNT ((int)(sizeof archs / sizeof archs[0]))

FG_EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int *count)
{
    if (!count)
        return NVRTC_ERROR_INVALID_INPUT;
    *count = ARCH_COUNT;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetSupportedArchs(int *out)
{
    if (!out)
        return NVRTC_ERROR_INVALID_INPUT;
    memcpy(out, archs, sizeof archs);
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcCreateProgram(struct program **program, const char *source,
                                         const char *name, int header_count,
                                         const char *const *headers,
                                         const char *const *include_names)
{
    if (!program || !source || header_count < 0)
        return NVRTC_ERROR_INVALID_INPUT;
    struct program *p = calloc(1, sizeof *p);
    if (!p)
        return NVRTC_ERROR_OUT_OF_MEMORY;
    /* PTX text (NUL-terminated, as nvrtcGetPTXSize counts it) that names the program. */
    int length = snprintf(NULL, 0, "// vramshim fake NVRTC: %s (not compiled)\n",
                          name ? name : "default_program");
    p->image = malloc((size_t)length + 1);
    if (!p->image) {
        free(p);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    snprintf(p->image, (size_t)length + 1, "// vramshim fake NVRTC: %s (not compiled)\n",
             name ? name : "default_program");
    p->image_size = (size_t)length + 1;
    *program = p;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcDestroyProgram(struct program **program)
{
    if (!program || !*program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    struct program *p = *program;
    for (int i = 0; i < p->name_count; i++)
        free(p->names[i]);
    free(p->names);
    free(p->image);
    free(p);
    *program = NULL;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcCompileProgram(struct program *program, int option_count,
                                          const char *const *options)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (option_count < 0 || (option_count > 0 && !options))
        return NVRTC_ERROR_INVALID_INPUT;
    program->compiled = 1;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcAddNameExpression(struct program *program, const char *name)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!name)
        return NVRTC_ERROR_INVALID_INPUT;
    char **grown = realloc(program->names, (size_t)(program->name_count + 1) * sizeof *grown);
    if (!grown)
        return NVRTC_ERROR_OUT_OF_MEMORY;
    program->names = grown;
    program->names[program->name_count] = strdup(name);
    if (!program->names[program->name_count])
        return NVRTC_ERROR_OUT_OF_MEMORY;
    program->name_count++;
    return NVRTC_SUCCESS;
}

/* A name expression lowers to itself: the fake driver's modules have every function. */
FG_EXPORT nvrtcResult nvrtcGetLoweredName(struct program *program, const char *name,
                                          const char **lowered)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!name || !lowered)
        return NVRTC_ERROR_INVALID_INPUT;
    if (!program->compiled)
        return NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION;
    for (int i = 0; i < program->name_count; i++) {
        if (strcmp(program->names[i], name) == 0) {
            *lowered = program->names[i];
            return NVRTC_SUCCESS;
        }
    }
    return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
}

/* The compiled image, as PTX or as CUBIN alike. */
static nvrtcResult image_size(struct program *program, size_t *size)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!size)
        return NVRTC_ERROR_INVALID_INPUT;
    *size = program->compiled ? program->image_size : 0;
    return NVRTC_SUCCESS;
}

static nvrtcResult image(struct program *program, char *out)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!out)
        return NVRTC_ERROR_INVALID_INPUT;
    if (program->compiled)
        memcpy(out, program->image, program->image_size);
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetPTXSize(struct program *p, size_t *size) { return image_size(p, size); }
FG_EXPORT nvrtcResult nvrtcGetPTX(struct program *p, char *out) { return image(p, out); }
FG_EXPORT nvrtcResult nvrtcGetCUBINSize(struct program *p, size_t *size) { return image_size(p, size); }
FG_EXPORT nvrtcResult nvrtcGetCUBIN(struct program *p, char *out) { return image(p, out); }

/* The log: empty (a NUL), as after a compilation without warnings. */
FG_EXPORT nvrtcResult nvrtcGetProgramLogSize(struct program *program, size_t *size)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!size)
        return NVRTC_ERROR_INVALID_INPUT;
    *size = 1;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetProgramLog(struct program *program, char *log)
{
    if (!program)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (!log)
        return NVRTC_ERROR_INVALID_INPUT;
    log[0] = '\0';
    return NVRTC_SUCCESS;
}

FG_EXPORT const char *nvrtcGetErrorString(nvrtcResult result)
{
    switch (result) {
    case 0: return "NVRTC_SUCCESS";
    case 1: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case 2: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case 3: return "NVRTC_ERROR_INVALID_INPUT";
    case 4: return "NVRTC_ERROR_INVALID_PROGRAM";
    case 5: return "NVRTC_ERROR_INVALID_OPTION";
    case 6: return "NVRTC_ERROR_COMPILATION";
    case 7: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case 8: return "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
    case 9: return "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    case 10: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    case 11: return "NVRTC_ERROR_INTERNAL_ERROR";
    default: return "NVRTC_ERROR unknown";
    }
}
