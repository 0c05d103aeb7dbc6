package migrations_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/pgfence/pgfence/migrations"
)

// Up at start-up: safe from every replica at once (golang-migrate
// serialises them with an advisory lock), a no-op when the schema is
// current.
func ExampleUp() {
	ctx := context.Background()
	databaseURL := os.Getenv("DATABASE_URL")
	if err := migrations.Up(ctx, databaseURL); err != nil {
		log.Fatal(err) // the error never shows the password
	}
	version, dirty, err := migrations.Version(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("schema current:", version == latest && !dirty)
	// Output:
	// schema current: true
}
