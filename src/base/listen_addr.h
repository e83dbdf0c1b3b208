/* A listening address as a job gives it (log.prometheus): "PORT" (loopback), "ADDR:PORT"
 * or "[ADDR6]:PORT". One parser for the job's check and the server that binds it. */
#ifndef SHLM_LISTEN_ADDR_H
#define SHLM_LISTEN_ADDR_H

#include <stddef.h>

/* host and port as getaddrinfo takes them; 0, or -1 with why. */
int listen_addr_parse(const char *spec, char *host, size_t hostlen, char *port, size_t portlen,
                      char *why, size_t whylen);

#endif
