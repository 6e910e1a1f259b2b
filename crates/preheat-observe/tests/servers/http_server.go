// A net/http server for preheat-observe's tests, built static (CGO_ENABLED=0, Go's default for
// many deployments): every request is answered "pong\n". Usage: http_server PORT
package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("pong\n")) })
	http.ListenAndServe("127.0.0.1:"+os.Args[1], nil)
}
