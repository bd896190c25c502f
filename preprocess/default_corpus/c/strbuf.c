#include <stdlib.h>
#include <string.h>

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} strbuf;

int strbuf_reserve(strbuf *sb, size_t extra) {
    if (sb->len + extra + 1 <= sb->cap) return 0;
    size_t cap = sb->cap ? sb->cap : 16;
    while (cap < sb->len + extra + 1) cap *= 2;
    char *p = realloc(sb->data, cap);
    if (!p) return -1;
    sb->data = p;
    sb->cap = cap;
    return 0;
}

int strbuf_append(strbuf *sb, const char *s, size_t n) {
    if (strbuf_reserve(sb, n) != 0) return -1;
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
    return 0;
}

void strbuf_free(strbuf *sb) {
    free(sb->data);
    sb->data = NULL;
    sb->len = sb->cap = 0;
}
