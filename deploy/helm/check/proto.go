package check

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// PeerPackage is the proto package of the replica-to-replica service: no
// edge may route it from outside.
const PeerPackage = "openshell.peer.v1"

// Services lists the fully qualified gRPC services ("package.Service") the
// .proto files in dir declare, sorted. Enough of a parser for this
// repository's files: one `package` line per file, `service Name {` lines.
func Services(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.proto"))
	if err != nil {
		return nil, err
	}
	var services []string
	for _, path := range files {
		found, err := servicesIn(path)
		if err != nil {
			return nil, err
		}
		services = append(services, found...)
	}
	sort.Strings(services)
	return services, nil
}

func servicesIn(path string) ([]string, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var pkg string
	var names []string
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "package":
			pkg = strings.TrimSuffix(fields[1], ";")
		case "service":
			names = append(names, strings.TrimSuffix(fields[1], "{"))
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	services := make([]string, 0, len(names))
	for _, name := range names {
		services = append(services, pkg+"."+name)
	}
	return services, nil
}

// IsPeer reports whether a fully qualified service belongs to the peer
// package.
func IsPeer(service string) bool {
	return strings.HasPrefix(service, PeerPackage+".")
}
