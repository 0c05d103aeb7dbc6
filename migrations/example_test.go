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

// Force after a migration whose outcome is unknown (its connection was
// lost): the operator has checked the schema and found that migration 4
// did not commit, so version 3 is the truth. Force runs nothing; Up then
// applies 4 and the rest.
func ExampleForce() {
	ctx := context.Background()
	databaseURL := os.Getenv("DATABASE_URL")
	version, dirty, err := migrations.Version(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	if dirty && version == 4 {
		if err := migrations.Force(ctx, databaseURL, 3); err != nil {
			log.Fatal(err)
		}
	}
	if err := migrations.Up(ctx, databaseURL); err != nil {
		log.Fatal(err)
	}
}
