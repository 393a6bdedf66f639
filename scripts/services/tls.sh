# shellcheck shell=bash
# Test TLS material, made with openssl on every start of a service that
# serves TLS (scripts/services/kafka). Sourced, not executed.
#
#   make_tls DIR    (re)creates DIR holding, all PEM:
#     ca.pem ca.key           the test CA (30 days)
#     other-ca.pem            a CA that signed nothing here ("unknown CA")
#     server.pem              key + certificate for DNS:localhost only (so
#                             127.0.0.1 is a host name mismatch), by ca.pem
#     server.key server.crt   the same, apart
#     expired.pem             key + certificate for localhost that expired
#                             in 2020, by ca.pem
#     client.crt client.key   a client certificate by ca.pem; the key is
#                             encrypted with the password in client.pass
# Nothing here is secret: the CA and keys exist for loopback tests only.
make_tls() {
  local dir="$1" ossl
  ossl=(openssl)
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  rm -rf "$dir"
  mkdir -p "$dir"
  (
    cd "$dir" || exit 1
    set -e
    "${ossl[@]}" req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 \
      -subj "/CN=prosody test CA" 2>/dev/null
    "${ossl[@]}" req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 30 \
      -subj "/CN=prosody other CA" 2>/dev/null
    printf 'subjectAltName=DNS:localhost\n' >san.ext
    "${ossl[@]}" req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
    "${ossl[@]}" x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -extfile san.ext -out server.crt 2>/dev/null
    cat server.key server.crt >server.pem
    # An expired certificate: `openssl ca` takes explicit dates.
    mkdir -p ca.db
    : >ca.db/index.txt
    echo 1000 >ca.db/serial
    cat >ca.cnf <<'EOF'
[ca]
default_ca = test_ca
[test_ca]
dir = ca.db
database = ca.db/index.txt
new_certs_dir = ca.db
serial = ca.db/serial
default_md = sha256
policy = any
copy_extensions = copy
unique_subject = no
[any]
commonName = supplied
[san]
subjectAltName = DNS:localhost
EOF
    "${ossl[@]}" req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost" 2>/dev/null
    "${ossl[@]}" ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr -out expired.crt \
      -startdate 20200101000000Z -enddate 20200201000000Z -extensions san -notext 2>/dev/null
    cat expired.key expired.crt >expired.pem
    echo "client-key-secret" >client.pass
    "${ossl[@]}" req -newkey rsa:2048 -keyout client.key -passout file:client.pass -out client.csr \
      -subj "/CN=prosody-client" 2>/dev/null
    "${ossl[@]}" x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
      -out client.crt 2>/dev/null
    rm -f ./*.csr
  ) || die "could not make the test TLS material in $dir (openssl)"
}
