"""Task generators and converters that write train/test files in verl's row format."""
