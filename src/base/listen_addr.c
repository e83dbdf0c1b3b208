/* Listening addresses (listen_addr.h). */
#include "src/base/listen_addr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int listen_addr_parse(const char *spec, char *host, size_t hostlen, char *port, size_t portlen,
                      char *why, size_t whylen) {
    const char *colon = NULL, *h = spec;
    size_t hn = 0;
    if (spec[0] == '[') { /* [v6]:port */
        const char *close = strchr(spec, ']');
        if (!close || close[1] != ':') {
            snprintf(why, whylen, "expected [ADDRESS]:PORT");
            return -1;
        }
        h = spec + 1;
        hn = (size_t)(close - h);
        colon = close + 1;
    } else if ((colon = strrchr(spec, ':')) != NULL) {
        hn = (size_t)(colon - spec);
    }
    const char *p = colon ? colon + 1 : spec;
    char *end;
    long v = strtol(p, &end, 10);
    if (!*p || *end || v < 0 || v > 65535) {
        snprintf(why, whylen, "expected PORT, ADDRESS:PORT or [ADDRESS]:PORT with PORT in "
                 "0..65535");
        return -1;
    }
    if (colon && hn == 0) {
        snprintf(why, whylen, "no address before ':' (give PORT alone for loopback)");
        return -1;
    }
    if (!colon) snprintf(host, hostlen, "127.0.0.1");
    else snprintf(host, hostlen, "%.*s", (int)hn, h);
    snprintf(port, portlen, "%ld", v);
    return 0;
}
