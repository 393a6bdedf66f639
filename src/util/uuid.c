/*
 * uuid.c - name-based UUIDs (version 5), on OpenSSL's SHA-1: apart from
 * util.c, which the fuzz targets build without OpenSSL.
 */
#include <openssl/evp.h>
#include <string.h>

#include "util.h"

/* RFC 4122's name spaces: URL (the original's timer segments) and OID
 * (its deferral segments). */
const uint8_t pr__uuid_ns_url[16] = {0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad,
                                     0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0,
                                     0x4f, 0xd4, 0x30, 0xc8};
const uint8_t pr__uuid_ns_oid[16] = {0x6b, 0xa7, 0xb8, 0x12, 0x9d, 0xad,
                                     0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0,
                                     0x4f, 0xd4, 0x30, 0xc8};

int pr__uuid_v5(const uint8_t ns[16], const void *name, size_t n,
                uint8_t out[16]) {
  uint8_t md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  int ok = c && EVP_DigestInit_ex(c, EVP_sha1(), NULL) &&
           EVP_DigestUpdate(c, ns, 16) && EVP_DigestUpdate(c, name, n) &&
           EVP_DigestFinal_ex(c, md, &len) && len >= 16;
  EVP_MD_CTX_free(c);
  if (!ok)
    return -1;
  memcpy(out, md, 16);
  out[6] = (uint8_t)((out[6] & 0x0f) | 0x50);
  out[8] = (uint8_t)((out[8] & 0x3f) | 0x80);
  return 0;
}
