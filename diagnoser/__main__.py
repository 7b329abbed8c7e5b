from diagnoser.cli import main

main()
