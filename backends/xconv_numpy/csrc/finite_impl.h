/* The finiteness check of finite.c for one element type T (suffix SUF): W the unsigned word that holds T's exponent
 * (T's own width, or its high half: HIGH 1), EXP the exponent's bits in it. The template undefines W, EXP and HIGH. */

/* 1 when the n elements at p are all finite, else 0: an element is not when its exponent bits are all set. */
int XCONV_T(xconv_all_finite)(const T *p, int64_t n) {
    W bad = 0;
    for (int64_t i = 0; i < n; i++) {
        W b;
        memcpy(&b, (const char *)(p + i) + HIGH * (sizeof(T) - sizeof(W)), sizeof b);
        bad |= (b & EXP) == EXP;
    }
    return !bad;
}

#undef W
#undef EXP
#undef HIGH
