module example.invalid/openshell/sdk-go

go 1.24

require google.golang.org/protobuf v1.36.12
