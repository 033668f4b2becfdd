// Package schema decodes Schema Registry records for kpar's forward package.
package schema
