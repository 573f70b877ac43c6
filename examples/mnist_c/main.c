/* An exported MNIST model in a C program, without Python.
 *
 * The model's folder (m.export(DIR), or mnist_train.py --export DIR) holds
 * nn.c, with the trained weights built in, and nn.h, its API. Copy them here
 * and build with one line (gcc, clang or tcc):
 *
 *     cc -O2 main.c nn.c -lm -lpthread
 *     cc -O2 -DNN_NO_THREADS main.c nn.c -lm      (one thread, no pthreads)
 *
 * Then ./a.out digits.f64: the rows of digits.f64 (float64, native byte
 * order, NN_N_INPUTS = 794 per row: 784 pixels / 255, then the one-hot
 * label) are predicted; the loss of the first row is printed before and
 * after one SGD step on it. Numbers print with %.17g: they read back as the
 * exact doubles, the bits the Python module gives for the same rows. */
#include "nn.h"
#include <stdio.h>
#include <stdlib.h>

#define LR 0.1                 /* the learning rate of the step */
#define PIXELS 784             /* the inputs: the pixels, then the one-hot label */

/* The index of the largest of n values (the first of equals). */
static int argmax(const double *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* The rows of a float64 file (malloc'ed), their number in *rows; NULL on error. */
static double *read_rows(const char *path, long *rows)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return NULL;
    }
    long bytes = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    long row_bytes = (long)sizeof(double) * NN_N_INPUTS;
    double *X = NULL;
    if (bytes <= 0 || bytes % row_bytes != 0)
        fprintf(stderr, "%s: %ld bytes, not rows of %d float64 values\n", path, bytes, NN_N_INPUTS);
    else if ((X = malloc(bytes)) == NULL)
        fprintf(stderr, "out of memory\n");
    else if (fseek(f, 0, SEEK_SET) != 0 || fread(X, 1, bytes, f) != (size_t)bytes) {
        fprintf(stderr, "%s: could not be read\n", path);
        free(X);
        X = NULL;
    }
    fclose(f);
    *rows = bytes / row_bytes;
    return X;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s ROWS.f64\n", argv[0]);
        return 2;
    }
    long rows;
    double *X = read_rows(argv[1], &rows);
    if (X == NULL)
        return 1;

    /* The model: a state the caller owns; nn_init loads the exported weights. */
    void *model = malloc(nn_state_size());
    double *out = malloc(sizeof(double) * NN_N_OUTPUTS * rows);
    if (model == NULL || out == NULL || nn_init(model) != NN_OK) {
        fprintf(stderr, "could not set up the model\n");
        return 1;
    }

    /* Predict: the logits of every row, the digit is the largest. */
    if (nn_predict(model, rows, X, out) != NN_OK) {
        fprintf(stderr, "could not predict\n");
        return 1;
    }
    for (long r = 0; r < rows; r++) {
        const double *logits = out + r * NN_N_OUTPUTS, *label = X + r * NN_N_INPUTS + PIXELS;
        printf("row %ld: label %d, predicted %d, logits", r, argmax(label, NN_N_OUTPUTS),
               argmax(logits, NN_N_OUTPUTS));
        for (int j = 0; j < NN_N_OUTPUTS; j++)
            printf(" %.17g", logits[j]);
        printf("\n");
    }

    /* One training step on the first row: forward, backward, p -= LR * grad. */
    nn_set_input(model, X);
    printf("loss of row 0: %.17g\n", nn_forward(model, -1));
    nn_zero_grad(model);
    nn_backward(model);
    nn_update(model, LR);
    printf("after one step: %.17g\n", nn_forward(model, -1));

    nn_release(model);
    free(model);
    free(out);
    free(X);
    return 0;
}
