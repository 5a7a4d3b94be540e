//go:build !openshell_external

package native

// The static library of this platform, inside the module: `make go-native`
// links the checkout's build there; a release commit carries one archive per
// platform (scripts/release-go.sh). Build with -tags openshell_external and
// set CGO_LDFLAGS to link another build (for example a release archive:
// CGO_LDFLAGS="/path/libopenshell_c.a -ldl -lm -lpthread").

/*
#cgo linux,amd64 LDFLAGS: ${SRCDIR}/lib/linux_amd64/libopenshell_c.a -ldl -lm -lpthread
#cgo linux,arm64 LDFLAGS: ${SRCDIR}/lib/linux_arm64/libopenshell_c.a -ldl -lm -lpthread
#cgo darwin,arm64 LDFLAGS: ${SRCDIR}/lib/darwin_arm64/libopenshell_c.a -framework Security -framework CoreFoundation
*/
import "C"
